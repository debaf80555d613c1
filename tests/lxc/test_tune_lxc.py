"""``make tune``'s measured search in real LXC containers (systemd, the deploy's unit and env
file), the two nodes of one model, against the stand-in server in the place of SGLang (no GPU
here): the stand-in reads a landscape and the flags of the unit the search wrote (its ``python
-m sglang.launch_server``, through the real launcher, finds the stand-in's shim first); each
try is measured by the real serving benchmark of sglang 0.5.9 (the venv of
``test_secrets_lxc``, cached) through the verify phase's own benchmark step, on a file of the
user's own prompts (``bench_prompts_file``).

Through the pyinfra CLI (tests/deploys/tune.py, ``tasks.tune.tune_steps``): the real flag
lister reads the installed release's ``server_args.py`` before any restart; a candidate the
landscape fails to start (out of memory) is recorded as failed and tried again with the memory
given back; stopped with Ctrl-C the group serves the best so far and the next run goes on from
the record, each try measured once; each start measures several parts of the benchmark; the
group is tuned as one and left serving the best, each node's unit the one the deploy renders
from its tuned file (a ``make deploy`` right after changes nothing); the key is in no file the
search wrote nor in its output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pve_sglang.server.unit_text import LAUNCHER, render_unit, unit_path
from pve_sglang.server.render import server_files
from pve_sglang.tuning import record
from pve_sglang.tuning.deployed import tried
from pve_sglang.tuning.tuned_file import read_tuned
from test_secrets_lxc import (
    BENCH_STACKS,
    LAUNCHER_SOURCE,
    LOGS,
    REPO,
    STANDIN_DIR,
    TOKENIZER,
    TOKENIZER_CONFIG,
    bench_settings,
    bench_venv_folder,
    cached_venv,
    deploy_argv,
    hits,
    host_cmdlines,
    install_unit,
    put,
    settings,
    standin_started,
    test_deploy,
)

RELEASE = "0.5.9"
PORT = 39950 + os.getpid() % 40
#: Two coordinates: no cap serves the 4 clients at once (1 at a time with the cap of 1); the
#: server is found with the larger memory fraction, which runs out of memory once requests are
#: no longer capped (more of them running): no cap is tried again with less memory.
LANDSCAPE = yaml.safe_dump({
    "space": {"max_running_requests": [1, None], "mem_fraction_static": [0.85, 0.94]},
    "start": {"max_running_requests": 1, "mem_fraction_static": 0.94},
    "workload": {"concurrency": 4, "input_len": 12, "output_len": 8},
    "sglang_defaults": {"cap": 64}, "peak_tok_s": 1000, "half_running": 1,
    "kv": {"weights_fraction": 0.5, "tokens_per_fraction": 100000},
    "failures": [{"when": {"max_running_requests": None, "mem_fraction_static": {"ge": 0.94}},
                  "ends": "oom"}],
})
# ``python -m sglang.launch_server`` of the deploy's unit, through the real launcher, finds this
# one first (a drop-in's PYTHONPATH): it starts the stand-in with the unit's flags (the
# candidate's), the landscape and the pace added. The launcher hands the key to sglang in its
# own sys.argv (``--api-key``), which no process shows: an exec would put it on a real argv
# (where test_secrets_lxc, run beside, finds it), so it goes on in the environment, where the
# stand-in reads it.
SHIM = """\
import os, sys
standin = "{standin}"
args, env = list(sys.argv[1:]), dict(os.environ)
if "--api-key" in args:
    at = args.index("--api-key")
    env["SGLANG_API_KEY"] = args[at + 1]
    del args[at:at + 2]
os.execve(sys.executable, [sys.executable, standin + "/standin_sglang.py", "--logs",
          standin + "/logs", "--event-file", "/run/standin-event", "--pause-scale", "0.01",
          "--token-delay", "0.02", "--landscape", standin + "/landscape.yaml", *args], env)
"""
BEST = {"max_running_requests": None, "mem_fraction_static": 0.85}


#: The user's prompts (``bench_prompts_file``): 12 words each, in the stand-in tokenizer's words.
PROMPT_WORDS = 12


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"conversations": [
        {"content": " ".join(f"w{(n + i) % 200 + 1}" for i in range(PROMPT_WORDS))},
        {"content": "w1 w2 w3"}]}) + "\n" for n in range(16)))
    return path


def tune_settings(tmp_path: Path) -> dict:
    return {**bench_settings(RELEASE, tmp_path / "bench-history"), "server_port": PORT,
            "bench_prompts_file": str(prompts_file(tmp_path)),
            "bench_preset": "full", "bench_concurrencies": [4], "tune_concurrency": 4,
            "bench_num_prompts": 8, "bench_prompts_per_concurrency": 2,
            "enable_metrics": True, "bench_metrics_sample_ms": 100,
            "extra_server_args": ["--device", "cpu"],
            "max_running_requests": 1, "mem_fraction_static": 0.94,
            "tune_space": {"max_running_requests": [1, None],
                           "mem_fraction_static": [0.85, 0.94]}}


def serving_node(box, s) -> str:
    """BOX serving as the deploy left it, the stand-in in the place of sglang; its unit."""
    for name in ("standin_sglang.py", "landscape.py"):
        put(box, f"{STANDIN_DIR}/{name}", (REPO / "tests" / name).read_text())
    for log in LOGS.glob("*.log"):
        put(box, f"{STANDIN_DIR}/logs/{log.name}", log.read_text())
    put(box, f"{STANDIN_DIR}/landscape.yaml", LANDSCAPE)
    put(box, f"{STANDIN_DIR}/shim/sglang/__init__.py", "")
    put(box, f"{STANDIN_DIR}/shim/sglang/launch_server.py", SHIM.format(standin=STANDIN_DIR))
    put(box, LAUNCHER, LAUNCHER_SOURCE.read_text())
    put(box, f"{s.model_path}/tokenizer.json", json.dumps(TOKENIZER))
    put(box, f"{s.model_path}/tokenizer_config.json", json.dumps(TOKENIZER_CONFIG))
    put(box, f"{s.model_path}/config.json", json.dumps({"model_type": "llama"}))  # dense
    # The deploy's env file and unit, as the container phase renders them for this node.
    unit = install_unit(box, s, server_files(box.inventory_name, s, [], None).argv)
    standin_started(box, unit, f"Environment=PYTHONPATH={STANDIN_DIR}/shim")
    return unit


def starts(box, unit: str) -> int:
    return int(box.attach(f"journalctl -u {unit} -o cat | grep -c '^Started {unit}'").stdout)


def test_a_two_node_group_is_tuned_as_one_and_left_serving_the_best_as_the_deploy_renders_it(
        lxc_env, lxc_container_factory, tmp_path, sglang_wheel):
    """The two nodes of one model (``nodes``), both in the run: the first searches; each try
    is written to both units and restarts both; both are left on the best, each with its tuned
    file."""
    venv = cached_venv(lxc_env, RELEASE, BENCH_STACKS[RELEASE], bench_venv_folder(RELEASE),
                       sglang_wheel)
    boxes = lxc_container_factory(2, extra_config=[
        f"lxc.mount.entry = {venv} {settings().venv_path.strip('/')} none bind,create=dir 0 0",
    ])
    overrides = {**tune_settings(tmp_path), "nodes": [box.inventory_name for box in boxes],
                 "dist_init_addr": "192.0.2.1"}
    s = settings(**overrides)
    units = [serving_node(box, s) for box in boxes]
    unit = units[0]
    tuned_files = [tmp_path / "tuned" / f"lab-{n}.yml" for n in range(2)]
    hosts = [(box, {"settings": overrides, "tuned_file": str(tuned)})
             for box, tuned in zip(boxes, tuned_files)]
    tuned = tuned_files[0]

    # Ctrl-C at a terminal (SIGINT to the run's process group) once 2 tries are recorded: the
    # group is put on the best so far before the run ends; the record says it goes on.
    run = subprocess.Popen(deploy_argv("tests/deploys/tune.py", *hosts), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    deadline = time.monotonic() + 300
    while len(record.read_search(record.record_path(tuned)).tries) < 2:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-4000:]
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGINT)
    stopped_log = run.communicate(timeout=300)[0]
    stopped = record.read_search(record.record_path(tuned))
    assert run.returncode != 0 and "stopped with Ctrl-C" in stopped_log, stopped_log[-4000:]
    assert stopped.ended and stopped.ended["stopped"] == "stopped before its end"
    assert not stopped.finished and "the next run goes on from the record" in stopped_log
    so_far = stopped.ended["best"]
    assert read_tuned(tuned) == read_tuned(tuned_files[1]) == so_far
    for node in boxes:
        assert node.attach(["systemctl", "is-active", unit]).stdout.strip() == "active"
        assert node.attach(["cat", unit_path(s)]).stdout == render_unit(
            tried(s, so_far), server_files(node.inventory_name, tried(s, so_far), [], None).argv)

    # Run again to its end: the search goes on from its record, none of its tries measured
    # again.
    log, elapsed = test_deploy("tests/deploys/tune.py", *hosts)

    # The best: no cap (the landscape's 4 streams against 1), the fraction that starts.
    assert read_tuned(tuned) == BEST, tuned.read_text() + log[-8000:]
    kept = record.read_search(record.record_path(tuned))
    assert kept.finished and kept.ended["best"] == BEST
    assert [t.proposal for t in kept.tries[:len(stopped.tries)]] == [
        t.proposal for t in stopped.tries]  # replayed, not measured again
    endings = [t.outcome.ended for t in kept.tries]
    restarts = sum(t.outcome.start_s > 0 for t in kept.tries)
    print(f"make tune in LXC: {len(kept.tries)} tries, {restarts} restarts ({endings}) in "
          f"{elapsed:.0f}s")
    assert "oom" in endings and endings.count("measured") >= 4
    assert restarts < endings.count("measured") / 2  # a start measures several parts
    oom = next(t for t in kept.tries if t.outcome.ended == "oom")
    assert oom.proposal.candidate == {"max_running_requests": None, "mem_fraction_static": 0.94}
    rows = [t.outcome.row for t in kept.tries if t.outcome.ok]
    # Measured by the real benchmark's record, with the server's own metrics beside it.
    assert all(r["successful_requests"] >= 4 and r["concurrency"] == 4 for r in rows), rows
    # The user's prompts (12 words each), not the random ones of bench_input_len (16).
    assert all(r["total_input_tokens"] == PROMPT_WORDS * r["successful_requests"]
               for r in rows), rows
    assert any(r.get("running_reqs_max") for r in rows), rows
    fast = [t.outcome.objective for t in kept.tries
            if t.outcome.ok and t.proposal.candidate["max_running_requests"] is None]
    slow = [t.outcome.objective for t in kept.tries
            if t.outcome.ok and t.proposal.candidate["max_running_requests"] == 1]
    assert min(fast) > 1.5 * max(slow), (fast, slow)
    assert "every try" in log and "tuned with its group, by its first node" in log

    # Both nodes left serving the best, each with the unit the deploy renders from its tuned
    # file: a deploy right after writes the same bytes and restarts nothing. Each try restarted
    # both nodes together.
    best = tried(s, BEST)
    assert read_tuned(tuned_files[1]) == BEST
    assert starts(boxes[0], unit) == starts(boxes[1], unit) >= restarts
    assert hits(stopped_log) == 0
    for number, node in enumerate(boxes):
        path = unit_path(s)
        rendered = render_unit(best, server_files(node.inventory_name, best, [], None).argv)
        assert node.attach(["cat", path]).stdout == rendered
        assert f"--node-rank {number}" in rendered
        assert node.attach(["systemctl", "is-active", unit]).stdout.strip() == "active"
        # Written before the server's start: no restart pending for the deploy's unit step.
        node.attach(f'[ "$(stat -c %Y {path})" -le "$(date -d "$(systemctl show -p '
                    f'ExecMainStartTimestamp --value {unit})" +%s)" ]')
        serving = node.attach(f"tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value "
                              f"{unit})/cmdline").stdout
        assert "--mem-fraction-static 0.85" in serving and "--max-running-requests" not in serving
    # The key is in no file the search wrote here and not in its output.
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".png"]
    assert tuned_files[0].with_suffix(".png").exists()
    assert hits(log) == 0 and not [p for p in written if hits(p.read_text(errors="replace"))]
    assert hits(host_cmdlines()) == 0  # nor any process's argv, the group serving
    assert yaml.safe_load(tuned.read_text()) == BEST

    # One node of the group alone (--limit): refused before any change.
    before = [starts(node, unit) for node in boxes]
    alone = subprocess.run([*deploy_argv("tests/deploys/tune.py", *hosts), "--limit",
                            boxes[1].inventory_name], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode != 0, alone.stdout[-3000:]
    assert (f"a multi-node group is tuned as one, and {boxes[0].inventory_name} is not in this "
            "run" in alone.stdout + alone.stderr), (alone.stdout + alone.stderr)[-3000:]
    assert [starts(node, unit) for node in boxes] == before
    assert read_tuned(tuned) == BEST and kept.tries == record.read_search(record.record_path(tuned)).tries


#: Behind a gateway: one coordinate, the memory fraction that never runs out: no cap is best.
REPLICA_SPACE = {"max_running_requests": [1, None]}


def gateway_inventory(folder: Path, gateway, boxes, s, overrides: dict,
                      tuned_files: list[Path]) -> Path:
    """The gateway (real smg, its worker list the replicas BOXES) and, when TUNED_FILES, the
    replicas with their settings and tuned files."""
    from test_gateway_lxc import SETTINGS as GATEWAY_SETTINGS

    workers = [{"name": box.inventory_name, "has_key": True,
                "url": f"http://{box.address.ip}:{s.server_port}"} for box in boxes]
    gw = {**gateway.host_data(), "settings": GATEWAY_SETTINGS, "gateway_worker_list": workers,
          "check_timeout_s": 30,
          "worker_keys": [s.api_key.get_secret_value()] * len(boxes)}
    replicas = [(box.inventory_name, {**box.host_data(), "settings": overrides,
                                      "tuned_file": str(tuned)})
                for box, tuned in zip(boxes, tuned_files)]
    path = folder / ("tune_inventory.py" if tuned_files else "gateway_inventory.py")
    path.write_text(f"gateways = [({gateway.inventory_name!r}, {gw!r})]\n"
                    + (f"replicas = {replicas!r}\n" if replicas else ""))
    return path


PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def test_replicas_behind_a_gateway_are_tuned_once_out_of_its_rotation_and_the_best_rolls_to_the_other(
        lxc_env, lxc_container_factory, package_index, tmp_path, sglang_wheel):
    """Two replicas of one model behind the real smg (issue 51): ``make tune`` searches on the
    first alone: it is taken out of the gateway's rotation (drained) before its first restart,
    its tries restart and are measured while the other serves every request, then it is given
    back, and the best rolls to the other by the roll's steps (out, drained, its unit written
    and restarted once, its start followed, a generation asked as the gateway asks it, given
    back), its tuned file the first's. A client sending through the gateway the whole time,
    streamed and asked whole, sees no failed request."""
    from test_gateway_lxc import CLIENT, GATEWAY_PORT, SCRIPT
    from test_gateway_lxc import KEY as GATEWAY_KEY
    from wheels import locked_wheels

    from pve_sglang.config.gateway import smg_lock_path

    venv = cached_venv(lxc_env, RELEASE, BENCH_STACKS[RELEASE], bench_venv_folder(RELEASE),
                       sglang_wheel)
    smg_wheels = locked_wheels(smg_lock_path("1.13.0", "3.11"))
    boxes = lxc_container_factory(2, network="bridge", extra_config=[
        f"lxc.mount.entry = {venv} {settings().venv_path.strip('/')} none bind,create=dir 0 0"])
    [gateway] = lxc_container_factory(1, network="bridge", extra_config=[
        f"lxc.mount.entry = {smg_wheels} opt/wheels none bind,ro,create=dir 0 0"])
    # The servers' key is the gateway's, as in test_gateway_lxc: smg 1.13.0 passes the client's
    # key on to the worker (a worker with another key answers 401), which the deploy's gateway
    # phase refuses before any change (gateway.workers.key_problem); this test's deploy writes
    # the gateway's files itself (tests/deploys/gateway.py), past that check.
    overrides = {**tune_settings(tmp_path), "server_host": "0.0.0.0", "api_key": GATEWAY_KEY,
                 "mem_fraction_static": 0.85, "tune_space": REPLICA_SPACE}
    s = settings(**overrides)
    unit = [serving_node(box, s) for box in boxes][0]
    done = subprocess.run([PYINFRA, str(gateway_inventory(tmp_path, gateway, boxes, s, overrides,
                                                          [])), "tests/deploys/gateway.py", "-y"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    put(gateway, CLIENT, (REPO / "tests" / "gateway_client.py").read_text())
    tuned_files = [tmp_path / "tuned" / f"replica-{n}.yml" for n in range(2)]
    before = [starts(box, unit) for box in boxes]

    def listed() -> dict:
        status = gateway.attach(SCRIPT.replace(" --gateway", " status --gateway", 1),
                                check=False).stdout
        return {w["url"]: w["is_healthy"] for w in json.loads(status or "{}").get("workers") or []}

    urls = [f"http://{box.address.ip}:{s.server_port}" for box in boxes]
    until = "/run/tune-done"
    load = subprocess.Popen(
        ["lxc-attach", "-P", str(gateway.lxc_path), "-n", gateway.name, "--clear-env", "-v",
         "API_KEY=" + GATEWAY_KEY, "--", "python3", CLIENT, "requests", "--url",
         f"http://127.0.0.1:{GATEWAY_PORT}", "--until", until, "--concurrency", "2",
         "--tokens", "8", "--whole-every", "3"], stdout=subprocess.PIPE, text=True)
    run = subprocess.Popen([PYINFRA, str(gateway_inventory(tmp_path, gateway, boxes, s, overrides,
                                                  tuned_files)),
                            "tests/deploys/tune.py", "-y"], cwd=REPO,
                           stdout=(tmp_path / "tune.log").open("w"), stderr=subprocess.STDOUT)
    # While its tries are measured, the first is out of the rotation; the other serves.
    alone = []
    while run.poll() is None:
        if record.read_search(record.record_path(tuned_files[0])).tries and not alone:
            alone.append(listed())
        time.sleep(0.2)
    log = (tmp_path / "tune.log").read_text()
    gateway.attach(f"touch {until}")
    client = json.loads(load.communicate(timeout=120)[0])
    assert run.returncode == 0, log[-8000:]
    assert alone == [{urls[1]: True}], (alone, log[-4000:])
    assert client["codes"] == {"200": len(client["requests"])}, client["by_kind"]
    assert set(client["by_kind"]) == {"stream", "whole"}, client["by_kind"]
    # Tuned once, on the first; the best (no cap) kept for both and served by both.
    kept = record.read_search(record.record_path(tuned_files[0]))
    assert kept.finished and kept.ended["best"] == {"max_running_requests": None}, log[-6000:]
    assert not record.record_path(tuned_files[1]).exists()
    assert read_tuned(tuned_files[0]) == read_tuned(tuned_files[1]) == kept.ended["best"]
    assert (f"{boxes[1].inventory_name}: make tune: tuned with its replicas behind "
            f"{gateway.inventory_name}, by {boxes[0].inventory_name}") in log
    assert f"make tune: the best rolled to {boxes[1].inventory_name}: drained in" in log, log[-6000:]
    best = tried(s, kept.ended["best"])
    for box in boxes:
        rendered = render_unit(best, server_files(box.inventory_name, best, [], None).argv)
        assert box.attach(["cat", unit_path(s)]).stdout == rendered
        serving = box.attach(f"tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value "
                             f"{unit})/cmdline").stdout
        assert "--max-running-requests" not in serving
    # The other restarted once, for the best; both given back.
    assert starts(boxes[1], unit) == before[1] + 1
    assert starts(boxes[0], unit) > before[0]
    assert listed() == {url: True for url in urls}
    assert hits(log) == 0
    # No process on this machine shows the key on its argv (the stand-ins serve on).
    assert hits(host_cmdlines()) == 0
