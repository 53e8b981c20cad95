"""Does the CUDA path work: the command, its dtypes and the tool path on one NVIDIA GPU."""
