"""Package discovery for setuptools (everything else is in pyproject.toml).

Every subpackage of ``lit_grpo`` is discovered, so a new one ships without editing a list; ``callbacks/`` lives at
the top of the checkout (one folder per part of the product) and installs as ``lit_grpo.callbacks``.
"""

from setuptools import find_packages, setup

CALLBACKS = ["lit_grpo.callbacks"] + [f"lit_grpo.callbacks.{p}" for p in find_packages("callbacks")]

setup(
    packages=find_packages(include=["lit_grpo", "lit_grpo.*"]) + CALLBACKS,
    package_dir={"lit_grpo.callbacks": "callbacks"},
)
