"""lit-grpo: GRPO and tree-relative policy optimisation of LoRA policies on PyTorch Lightning."""

__version__ = "0.1.0"
