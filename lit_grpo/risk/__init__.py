"""The distributional risk head, its fit, the probes, selective-prediction metrics and the infer/defer rule."""
