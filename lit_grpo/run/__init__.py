"""Plumbing below every part but the command (``cli/``), whoever builds the Trainer: rules across parts, distributed
helpers, resume, the run directory, signals and exit codes, the callbacks every run needs, host memory, seeds, model
files and the evaluation tables."""
