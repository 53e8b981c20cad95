"""The issue's hostile code, one snippet each (tests/test_sandbox_hostile.py runs them through the sandbox,
tests/test_sandbox_command.py through the ``lit-grpo`` command). Each one, where the attack works, ends with exit
status 0 (and says so); where the sandbox holds, it fails. ``{port}``, ``{outside}``, ``{victim}`` and ``{secret}``
are filled in by the test: a server it listens with, a file path outside the scratch directory, the pid of a
stand-in trainer process, the name of a variable of the trainer's environment."""

from __future__ import annotations

SNIPPETS = {
    "infinite_loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))",
    "gigabyte_of_output": "import sys\nfor _ in range(2**14):\n    sys.stdout.write('x' * 2**16)",
    "write_outside": "open({outside!r}, 'w').write('escaped')\nprint('wrote outside')",
    "connect_local_server": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')",
    "kill_trainer": (  # the trainer found in /proc by its command line, then the known pid
        "import os, signal\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        if b'stand-in-trainer' in open(f'/proc/{{pid}}/cmdline', 'rb').read():\n"
        "            os.kill(int(pid), signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "os.kill({victim}, signal.SIGKILL)\nprint('killed')"),
    "os_exit": "print('bye', flush=True)\nimport os\nos._exit(7)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "setsid_background": (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(600)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\nprint('left one behind')"),
    "read_environ": "import os\nprint(os.environ[{secret!r}])",
    "read_proc_environ": "print(open('/proc/{victim}/environ').read())\nprint(open('/proc/{trainer}/environ').read())",
}


def snippet(name: str, **values: object) -> str:
    return SNIPPETS[name].format(**values)
