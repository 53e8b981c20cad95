"""``python -m lit_grpo.cli``: the ``lit-grpo`` command."""

from lit_grpo.cli import main

if __name__ == "__main__":
    main()
