"""What a deploy costs, measured against real LXC containers on this machine (issue 7).

    make bench                       # or: python bench/deploy_cost.py [--reps 5] [--sizes 1,2,4]

One module a job: ``fleet`` (the containers' rootfs, wheelhouse, hosts files, snapshots and
cleanup), ``driver`` (pyinfra's CLI in a child Python, every command recorded), ``runner`` (one
measured deploy, and the first-run and no-op rounds), ``counting`` (pyinfra's JSON, commands
grouped, restarts, overlap), ``report`` (goals, statistics, the JSON report and the table),
``plot`` (the figure), ``cli`` (arguments, the work dir, writing ``bench/results/``).

Steps, all in a private LXC path under /tmp that is destroyed at the end (also on error):

1. a rootfs tarball for the containers: ``devtools.lxc_env``'s cached Debian rootfs with the
   test-time additions (resolv.conf, this machine's CA certificates, sshd and apt timers off);
2. one hosts file per size (1, 2, 4 containers), every container installing the real sglang
   wheel (``stack_install: sglang-no-deps``) from a bind-mounted wheelhouse; the host has no
   GPU, so the CPU-runnable phases run: container create/start, CA store, apt base packages,
   uv, the venv, sglang, the autotune patch, the unit (not started: it needs a GPU);
3. the first run of each size (that sets the containers up), then the no-op re-runs, sizes
   interleaved in each round so that their ratios come from the same conditions.

Commands are counted for real: every deploy runs pyinfra's own CLI in a child Python
(``python -m devtools.deploy_cost.driver``) that wraps ``pyinfra.connectors.local.run_local_process``, the
one place where a command leaves pyinfra on this machine (the ``@local`` host's commands and
every ``lxc-attach`` of the container connector). Each command is attributed to the fact,
operation or connector step that sent it (``_get_fact``, ``_run_host_op``,
``ContainerConnector.container_state``/``put_file``/``get_file`` are wrapped too).

Restarts: commands that restart or stop anything (``systemctl restart|stop|start``,
``lxc-stop``/``lxc-start``, ``pct reboot|start|stop``) are counted, and between runs each
container's init process (PID and start time) and the server unit's ``InvocationID`` and
``ExecMainStartTimestamp`` are compared.

Output: ``bench/results/deploy_cost.json``, ``bench/results/deploy_cost.png`` and a table.
"""

from __future__ import annotations

# Imports nothing else: the driver is run as this package's module and must import pyinfra_cli
# (gevent's monkey patching) before anything else.
import sys


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
