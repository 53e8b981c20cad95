"""Tool tasks, run as TRL 1.16 runs tools (docs/guide.md#tools-and-environments): the task (``task.ToolTask``), one
episode's state (``episode``), the chat template's rendering and parsing (``chat_format``), the tools and their
messages (``calls``), where the calls run (``kit``, ``worker``, ``environment_host``), the rewards called once per
batch (``rewards``) and per turn (``turn_rewards``), and the shipped environments (``arithmetic``, ``stock``)."""
