"""Phase 5, the monitoring: Debian's Prometheus in the container a host's ``monitoring:`` names,
scraping every server, gateway and GPU host of the inventory with the deploy's rules; and on
each GPU host, Debian's prometheus-node-exporter with the GPU figures in its textfile folder.

In the monitoring container: the prometheus package; its configuration (``render``), the
shipped rules, the inventory's rules, each keyed server's key (a 0600 file of the prometheus
user, never in the configuration's text); key files of servers no longer in the inventory
removed (only names the deploy gives); ``promtool check config``, then a reload, only when one
of them changed. Its listen address (``/etc/default/prometheus``) changed: a restart.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.context import state
from pyinfra.facts.files import FindFiles
from pyinfra.operations import apt, files, server, systemd

from pve_sglang import remote
from pve_sglang.config.monitoring import MonitoringSettings
from pve_sglang.config.settings import ContainerSettings, host_settings
from pve_sglang.monitoring import render
from pve_sglang.monitoring.targets import Target, node_target
from pve_sglang.operations import debs, paths, systemd_unit
from pve_sglang.operations.changes import any_changed
from pve_sglang.preflight import driver_and_gpus
from pve_sglang.project import template
from pve_sglang.server.bench_history import load_runs
from tasks.common import run_when_container_exists, upload_script

PACKAGES = ["prometheus"]
NODE_PACKAGES = ["prometheus-node-exporter", "python3"]
NODE_DEFAULTS = "/etc/default/prometheus-node-exporter"
NODE_UNIT = "prometheus-node-exporter.service"
TEXTFILE_UNIT = "pve-sglang-gpu-textfile"


@deploy("Monitoring")
def monitoring_phase() -> None:
    """Prometheus in a monitoring container; the node exporter on a GPU host of an inventory
    that monitors."""
    if "monitoring" in host.groups:
        ms = host_settings(MonitoringSettings)
        found = scrape_targets(ms)
        keys = server_keys(found)
        caps = {str(k): int(v) for k, v in (host.data.get("monitoring_caps") or {}).items()}
        benchmarks = last_benchmarks(found)
        if host.data.get("monitoring_external"):
            existing_steps(ms, found, keys, caps, benchmarks)
            return
        run_when_container_exists(lambda: prometheus_steps(ms, found, keys, caps, benchmarks),
                                  "monitoring", lambda: planned_steps(ms, found))
    if "pve_hosts" in host.groups and state.inventory.get_group("monitoring", []):
        driver, _ = driver_and_gpus(host)
        if driver is not None:
            node_exporter_steps(host_settings(MonitoringSettings))


def scrape_targets(ms: MonitoringSettings) -> list[Target]:
    """The inventory's servers and gateways (``hosts_file.build_monitoring``), and the node
    exporter of each host with an NVIDIA driver (a host run on this machine, ``@local``,
    has no address the container knows: said, not scraped)."""
    found = [Target(**t) for t in host.data.get("monitoring_targets") or []]
    for pve in state.inventory.get_group("pve_hosts", []):
        if driver_and_gpus(pve)[0] is None:
            continue
        address = pve.data.get("ssh_hostname") or pve.name
        if address == "@local":
            logger.warning(f"{host.name}: GPU host {pve.name} runs pyinfra itself; set its "
                           "ssh_hostname to the address the monitoring container reaches it at")
            continue
        found.append(node_target(pve.name, str(address), ms.node_exporter_port))
    return found


def server_keys(found: list[Target]) -> dict[str, str]:
    """Each keyed server's API key (its container's ``api_key``), by inventory name."""
    keys = {}
    for target in found:
        if target.has_key:
            cs = host_settings(ContainerSettings, of=state.inventory.get_host(target.name))
            assert cs.api_key is not None  # has_key: the server's api_key is set
            keys[target.name] = cs.api_key.get_secret_value()
    return keys


def last_benchmarks(found: list[Target]) -> dict[str, float]:
    """Each server's best output tok/s of its last benchmark run, from the history on this
    machine (``bench_history_dir``; a run of this deploy counts from the next one)."""
    best = {}
    for target in found:
        if target.job == "sglang":
            cs = host_settings(ContainerSettings, of=state.inventory.get_host(target.name))
            tok_s = render.best_output_tok_s(load_runs(cs.bench_history_dir, target.name))
            if tok_s is not None:
                best[target.name] = tok_s
    return best


def planned_steps(ms: MonitoringSettings, found: list[Target]) -> list[str]:
    """What the monitoring steps do, in words, for a plan made before its container runs."""
    jobs = {job: sum(t.job == job for t in found) for job in ("sglang", "smg", "node")}
    return ["Debian's prometheus, " + ", ".join(f"{n} {job} targets" for job, n in jobs.items()),
            f"its rules and keys in {ms.monitoring_dir}, reloaded when they change"]


def prometheus_steps(ms: MonitoringSettings, found: list[Target], keys: dict[str, str],
                     caps: dict[str, int], benchmarks: dict[str, float] | None = None) -> None:
    """Prometheus in this container scraping FOUND, with each keyed server's key in KEYS (by
    inventory name), the request caps CAPS and last benchmarks BENCHMARKS the rules compare."""
    paths.watch(render.CONFIG_PATH, render.DEFAULTS_PATH)
    debs.deb_packages(name="Prometheus (Debian's)", packages=PACKAGES)
    changes = included_files(ms, found, keys, caps, benchmarks)
    changes.append(paths.put(name=f"Prometheus's configuration {render.CONFIG_PATH} "
                                  f"({len(found)} targets)",
                             src=StringIO(render.render_config(ms, found)),
                             dest=render.CONFIG_PATH, mode="644"))
    defaults = paths.put(name=f"Prometheus's address {render.DEFAULTS_PATH}",
                         src=StringIO(render.render_defaults(ms)), dest=render.DEFAULTS_PATH,
                         mode="644")
    systemd_unit.service_running(name=f"{render.UNIT} enabled and running", unit=render.UNIT,
                                 start=True, restart=any_changed(defaults, restarts=render.UNIT),
                                 since={"its address": render.DEFAULTS_PATH})
    # promtool first: a reload of a bad file would leave Prometheus on the old one, silently.
    # pyinfra's shell types its commands as str but yields each as given: a StringCommand keeps
    # its quoting.
    server.shell(name="Prometheus reloaded (its configuration checked by promtool)",
                 commands=[StringCommand("promtool check config", QuoteString(render.CONFIG_PATH),
                                         ">/dev/null"),  # type: ignore[list-item]
                           StringCommand("systemctl reload",  # type: ignore[list-item]
                                         QuoteString(render.UNIT))],
                 _if=any_changed(*changes, restarts=f"{render.UNIT} (reload)"))


def included_files(ms: MonitoringSettings, found: list[Target], keys: dict[str, str],
                   caps: dict[str, int], benchmarks: dict[str, float] | None = None) -> list:
    """What a Prometheus includes, in ``monitoring_dir``: the rules, the inventory's rules,
    each keyed server's key (0600, ``prometheus_user``'s), key files of servers gone removed;
    the operations that write them."""
    rules_dir, keys_dir = render.rules_dir(ms), render.keys_dir(ms)
    key_files = {render.key_path(ms, name): key for name, key in sorted(keys.items())}
    paths.watch(f"{rules_dir}/{render.RULES_NAME}", f"{rules_dir}/{render.INVENTORY_RULES_NAME}",
                render.scrape_path(ms), *key_files)
    paths.directory(name=f"Monitoring folder {ms.monitoring_dir}", path=ms.monitoring_dir,
                    mode="755")
    paths.directory(name=f"Rules folder {rules_dir}", path=rules_dir, mode="755")
    # The keys: readable by Prometheus alone.
    files.directory(name=f"Keys folder {keys_dir} ({ms.prometheus_user}'s, mode 0700)",
                    path=keys_dir, user=ms.prometheus_user, group=ms.prometheus_user, mode="700")
    changes = []
    for path, key in key_files.items():
        changes.append(paths.put(name=f"Scrape key {path} (mode 0600)", src=StringIO(key),
                                 dest=path, mode="600", secret=True))
        changes.append(files.file(name=f"{path} is {ms.prometheus_user}'s", path=path,
                                  user=ms.prometheus_user, group=ms.prometheus_user, mode="600"))
    for stale in stale_keys(keys_dir, set(key_files)):
        changes.append(files.file(name=f"Scrape key {stale} of a server no longer scraped "
                                       "removed", path=stale, present=False))
    changes.append(paths.put(name=f"Rules {rules_dir}/{render.RULES_NAME}",
                             src=StringIO(render.render_rules(ms)),
                             dest=f"{rules_dir}/{render.RULES_NAME}", mode="644"))
    changes.append(paths.put(
        name=f"Inventory's rules {rules_dir}/{render.INVENTORY_RULES_NAME} (thresholds, caps)",
        src=StringIO(render.render_inventory_rules(ms, benchmarks or {}, caps)),
        dest=f"{rules_dir}/{render.INVENTORY_RULES_NAME}", mode="644"))
    return changes


def existing_steps(ms: MonitoringSettings, found: list[Target], keys: dict[str, str],
                   caps: dict[str, int], benchmarks: dict[str, float] | None = None) -> None:
    """On the machine of the user's own Prometheus: only what its prometheus.yml includes
    (``included_files``, and the scrape configs in ``monitoring_dir``); its configuration,
    service and reload stay the user's."""
    included_files(ms, found, keys, caps, benchmarks)
    paths.put(name=f"Scrape configs {render.scrape_path(ms)} ({len(found)} targets)",
              src=StringIO(render.render_scrape_file(ms, found)), dest=render.scrape_path(ms),
              mode="644")
    logger.info(f"{host.name}: your Prometheus includes {render.rules_dir(ms)}/*.yml in its "
                f"rule_files and the jobs of {render.scrape_path(ms)} in its scrape_configs "
                "(docs/monitoring.md); reload it when they change")


def stale_keys(keys_dir: str, wanted: set[str]) -> list[str]:
    """Key files in KEYS_DIR the deploy wrote (its names alone) for servers not in WANTED."""
    found = host.get_fact(FindFiles, path=keys_dir, quote_path=True, maxdepth=1) or []
    return sorted(p for p in found
                  if p not in wanted and render.is_key_name(p.rsplit("/", 1)[-1]))


def node_exporter_steps(ms: MonitoringSettings) -> None:
    """On a GPU host: Debian's node exporter on ``node_exporter_port`` with its textfile
    collector in ``node_textfile_dir``, fed by the GPU textfile script on a systemd timer."""
    apt_packages = files_installed(NODE_PACKAGES)
    script = remote.path(remote.GPU_TEXTFILE)
    upload_script(remote.GPU_TEXTFILE, "Upload the GPU textfile script")
    files.directory(name=f"Textfile folder {ms.node_textfile_dir}", path=ms.node_textfile_dir,
                    mode="755")
    defaults = files.put(name=f"Node exporter's flags {NODE_DEFAULTS}",
                         src=StringIO(render.render_node_defaults(ms)), dest=NODE_DEFAULTS,
                         mode="644")
    unit = files.template(name=f"Unit {TEXTFILE_UNIT}.service",
                          src=template(f"{TEXTFILE_UNIT}.service.j2"),
                          dest=f"/etc/systemd/system/{TEXTFILE_UNIT}.service", mode="644",
                          script=render.systemd_arg(script),
                          textfile_dir=render.systemd_arg(ms.node_textfile_dir))
    timer = files.template(name=f"Timer {TEXTFILE_UNIT}.timer",
                           src=template(f"{TEXTFILE_UNIT}.timer.j2"),
                           dest=f"/etc/systemd/system/{TEXTFILE_UNIT}.timer", mode="644",
                           interval_s=ms.monitoring_scrape_interval_s)
    systemd.daemon_reload(name="Reload systemd units", _if=any_changed(unit, timer))
    systemd.service(name=f"{TEXTFILE_UNIT}.timer enabled and running",
                    service=f"{TEXTFILE_UNIT}.timer", running=True, enabled=True)
    systemd.service(name=f"{NODE_UNIT} enabled and running", service=NODE_UNIT, running=True,
                    enabled=True)
    systemd.service(name=f"{NODE_UNIT} restarted (its flags changed)", service=NODE_UNIT,
                    restarted=True, _if=any_changed(defaults, apt_packages))


def files_installed(packages: list[str]):
    """Debian PACKAGES on the host (pyinfra's apt, its lists refreshed once a day)."""
    return apt.packages(name="Node exporter (Debian's) and python3", packages=packages,
                        update=True, cache_time=86400, no_recommends=True)
