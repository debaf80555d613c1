"""
pyinfra's CLI in this process, with every command it sends recorded (run by ``runner`` as
``python -m devtools.deploy_cost.driver LOG_PATH -- PYINFRA_ARGS``).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # As the pyinfra command does before anything else: gevent's monkey patching.
    import pyinfra_cli  # noqa: F401

import json
import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def driver(log_path: str, pyinfra_args: list[str]) -> None:
    """Run ``pyinfra PYINFRA_ARGS`` here, writing every command it sends to LOG_PATH (JSON)."""
    import gevent

    from pyinfra.api.state import State
    from pyinfra.connectors.local import LocalConnector
    from pyinfra_cli.main import main as pyinfra_main

    from pve_sglang.connectors.container import ContainerConnector
    from pve_sglang.runtime import pyinfra_private

    t0 = time.monotonic()
    started_at = time.time()
    records: list[dict[str, Any]] = []
    stages: list[tuple[str, float]] = []
    stacks: dict[Any, list[dict[str, str]]] = {}
    current_state: list[Any] = []

    def stack() -> list[dict[str, str]]:
        return stacks.setdefault(gevent.getcurrent(), [])

    @contextmanager
    def frame(**values: str):
        frames = stack()
        frames.append(values)
        try:
            yield
        finally:
            frames.pop()

    def wrap(owner: Any, name: str, make_frame) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            with frame(**make_frame(*args, **kwargs)):
                return original(*args, **kwargs)

        setattr(owner, name, wrapper)

    def fact_frame(state, host, cls, args=None, kwargs=None, *rest, **kw):
        shown = ", ".join(f"{k}={v}" for k, v in sorted((kwargs or {}).items()))
        return {"kind": "fact", "name": cls.__name__, "args": shown[:160]}

    def op_frame(state, host, op_hash):
        meta = state.get_op_meta(op_hash)
        return {"kind": "op", "name": " / ".join(meta.names) or op_hash}

    wrap(*pyinfra_private.fact_read_hook(), fact_frame)
    wrap(*pyinfra_private.host_operation_hook(), op_frame)
    wrap(LocalConnector, "run_shell_command", lambda self, *a, **k: {"host": self.host.name})
    wrap(ContainerConnector, "container_state",
         lambda self: {"kind": "connector", "name": "container state (lxc-info)"})
    wrap(ContainerConnector, "put_file",
         lambda self, src, dest, *a, **k: {"kind": "transfer", "name": f"put {dest}"})
    wrap(ContainerConnector, "get_file",
         lambda self, src, *a, **k: {"kind": "transfer", "name": f"get {src}"})

    original_set_stage = State.set_stage

    def set_stage(self, stage):
        if not current_state:
            current_state.append(self)
        stages.append((stage.name, time.monotonic() - t0))
        return original_set_stage(self, stage)

    State.set_stage = set_stage

    local_mod, run_name = pyinfra_private.local_process_hook()
    original_run = getattr(local_mod, run_name)

    def run_local_process(command, *args, **kwargs):
        frames = stack()
        host = next((f["host"] for f in reversed(frames) if "host" in f), "?")
        inner = next((f for f in reversed(frames) if "kind" in f), {"kind": "other", "name": "?"})
        op = next((f["name"] for f in reversed(frames) if f.get("kind") == "op"), None)
        stage = current_state[0].current_stage.name if current_state else "?"
        start = time.monotonic()
        rc, output = original_run(command, *args, **kwargs)
        records.append({
            "host": host,
            "kind": inner["kind"],
            "name": inner["name"],
            "args": inner.get("args", ""),
            "op": op,
            "stage": stage,
            "start_s": round(start - t0, 4),
            "seconds": round(time.monotonic() - start, 4),
            "rc": rc,
            "command": command if len(command) <= 600 else command[:600] + "...",
        })
        return rc, output

    setattr(local_mod, run_name, run_local_process)

    sys.argv = ["pyinfra", *pyinfra_args]
    code: Any = 0
    try:
        code = pyinfra_main()
    except SystemExit as exit_:
        code = exit_.code
    finally:
        stages.append(("End", time.monotonic() - t0))
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        Path(log_path).write_text(json.dumps({
            "started_at": started_at, "stages": stages, "commands": records,
            "cpu_pyinfra_s": me.ru_utime + me.ru_stime,
            "cpu_commands_s": kids.ru_utime + kids.ru_stime,
        }))
    sys.exit(code if isinstance(code, int) else (0 if code is None else 1))


if __name__ == "__main__":
    rest = sys.argv[2:]
    driver(sys.argv[1], rest[1:] if rest[:1] == ["--"] else rest)
