"""Every default of pve-sglang, in one place.

Host data from the hosts file overrides any of these per Proxmox host or per container
(``pve_sglang.config.settings`` validates the merged result before anything runs). The settings
table of docs/settings.md is generated from this file (``python -m
pve_sglang.config.settings_table`` writes it): each setting's comment is its description there.
A default that a Proxmox release decides is imported from its one home (``pve_releases``);
imported names are no settings (pyinfra and ``load_defaults`` leave them out).
"""

from pve_sglang.pve_releases import DEVN_FROM

# --- Proxmox host -------------------------------------------------------------------------
# "pve": a Proxmox VE host driven with pct; "lxc": a plain LXC host driven with lxc-* tools.
platform = "pve"
# A host without an NVIDIA driver is an error; false skips the GPU steps (the local demo).
require_gpu = True
# Reload nvidia_uvm to bring uvm_disable_hmm=1 in force now (only when no GPU process runs).
reload_modules = False
# Proxmox storage that holds container templates.
template_storage = "local"
# Container template: a file name, or a prefix that takes the newest `pveam available` lists.
template = "debian-12-standard"
# pve-container release from which GPUs pass as native devN: entries (PVE 8.1+).
pve_container_native_dev_min = DEVN_FROM
# Plain LXC hosts: where containers live (lxc -P).
lxc_path = "/var/lib/lxc"
# Plain LXC hosts: the Debian release new containers get (debian template).
lxc_release = "bookworm"
# Plain LXC hosts: unpack this rootfs tarball instead of running the debian template.
lxc_rootfs_tarball = None
# Plain LXC hosts: more config lines the deploy owns; lxc.net.0.* lines here replace net0.
lxc_config = []

# --- Container ----------------------------------------------------------------------------
# Container hostname; null: "sglang-<VMID or name>".
hostname = None
# Proxmox storage for the container's root disk (Proxmox only).
rootfs_storage = "local-lvm"
# Root disk size in GiB, grown when larger, never shrunk (Proxmox only).
rootfs_size_gib = 200
# CPU cores of the container (Proxmox allows 1..8192).
cores = 32
# Memory of the container in MiB (Proxmox allows 16 and more).
memory_mib = 262144
# Swap of the container in MiB.
swap_mib = 0
# Network device of the container, in Proxmox's syntax; on plain LXC a veth on the bridge
# (lxcbr0: lxc-net's NAT bridge) with the keys name, bridge, hwaddr, mtu, ip, gw, ip6, gw6, tag.
net0 = "name=eth0,bridge=vmbr0,ip=dhcp"
# Unprivileged container (ids mapped from root's /etc/subuid range); cannot change after creation.
unprivileged = True
# Start the container when the host boots.
onboot = True
# LXC nesting feature (systemd in the container wants it); plain LXC: LXC's nesting.conf.
nesting = True
# GPUs to pass through: "all", or a list of indices, e.g. [0, 1].
gpus = "all"
# Host directories bind-mounted into the container: [{host_path, path, read_only}].
mounts = []

# --- Stack in the container ---------------------------------------------------------------
# The sglang release (an exact version, quoted): it picks torch, flashinfer, the kernel package
# and the CUDA major from its own wheel metadata (group_data/releases/, else fetched once). The
# default is the newest release the test suite proves end to end (`make release VERSION=X`
# moves it); "0.5.9" is the tuned run's set (torch 2.9.1, CUDA 12), its lock kept too.
sglang_version = "0.5.23"
# torch version; null: the one sglang_version requires (a pin the release does not allow is an error).
torch_version = None
# flashinfer-python version; null: the one sglang_version requires (likewise checked).
flashinfer_version = None
# CUDA toolkit (nvcc) for FlashInfer's JIT, from NVIDIA's Debian repository; null: the CUDA of
# the set's torch (12.8 for 0.5.9, 13.0 for 0.5.23). A pin must be of the release's CUDA major.
cuda_toolkit_version = None
# uv version that builds the venv.
uv_version = "0.13.8"
# Where the venv lives in the container.
venv_path = "/opt/sglang/venv"
# Package index to install from instead of PyPI (a private mirror).
pip_index_url = None
# CA certificates the container must trust (files or globs on the machine running pyinfra,
# e.g. a proxy's CA), added to its system store before anything is downloaded.
ca_certificates = []
# Directory of wheels in the container to install from (air-gapped sites).
wheelhouse = None
# Extra index for torch builds (e.g. a CUDA 12.8 index); null: torch's PyPI build.
torch_index_url = None
# "pinned": sglang, torch, flashinfer with their dependencies; "sglang-no-deps": sglang alone.
stack_install = "pinned"
# Lock of the pinned set (uv pip compile --generate-hashes output) on the machine running
# pyinfra; null: the repository's lock of the set (group_data/locks/), else one made there once.
stack_lock = None
# The containers' python3 (Debian 12: 3.11, Debian 13: 3.13); the lock is made for it and its
# release's glibc (2.36, 2.41). null: the python3 of the release of template or lxc_release.
stack_python = None
# Folder on the host that keeps the locked set's wheels, read-only in each container, which
# installs from it offline with hashes checked; null: each container downloads its own.
wheel_store = "/var/cache/pve-sglang/wheels"
# Install the locked set but sglang once per host, into a read-only layer in the wheel store
# that every container's venv reads (sglang stays in the venv: the autotune patch writes to
# it); false: each venv holds the whole set.
shared_layer = True
# URL of NVIDIA's driver runfile; null: NVIDIA's download URL for the host's version.
nvidia_runfile_url = None
# Path of the driver runfile on the machine running pyinfra (uploaded; no download).
nvidia_runfile_path = None

# --- SGLang server ------------------------------------------------------------------------
# systemd unit name of the server (and of its env file).
service_name = "sglang"
# Model directory in the container (--model-path).
model_path = "/models/model"
# Hugging Face repo fetched into model_path (or model_store), every file checked against the
# hub's size and sha256, resumed when cut short (HF token from the env file); null: the model
# comes from a mount (mounts) or is there already.
model_download = None
# Revision (branch, tag or commit) of model_download; null: the default branch. A branch or
# tag is resolved to its commit once and kept: a later move on the hub is reported, not
# followed (set the new commit here to serve it).
model_revision = None
# Folder on the host (e.g. on a ZFS dataset) that keeps model_download once per host, by
# repository and commit, fetched by the host and verified; each container gets its commit
# read-only at model_path. null: each container fetches it into its own model_path.
model_store = None
# Take files the hub (a mirror of your own, HF_ENDPOINT) lists without a sha256 or git blob id
# or a size: fetched unverified, and said so on every run; false: such a model is refused.
model_accept_unhashed = False
# Name the API serves the model as; null: the model path.
served_model_name = None
# IP address the server binds to (IPv4 or IPv6; 0.0.0.0 or :: for every interface); 127.0.0.1
# unless you expose it on purpose.
server_host = "127.0.0.1"
# Port of the server's HTTP API.
server_port = 30000
# Tensor-parallel size; null: one rank per GPU passed through (times the nodes).
tp_size = None
# MoE runner backend (--moe-runner-backend); flashinfer_cutlass runs with the autotune on.
moe_runner_backend = "flashinfer_cutlass"
# Attention backend (--attention-backend).
attention_backend = "flashinfer"
# Share of GPU memory for weights and KV cache (--mem-fraction-static), in (0, 1).
mem_fraction_static = 0.92
# Cap on running requests; null: no cap (a cap of 64 throttled the tuned run to a quarter).
max_running_requests = None
# Turn CUDA graphs off (as in the tuned run): --disable-cuda-graph, from 0.5.14
# --cuda-graph-backend-decode/--cuda-graph-backend-prefill disabled.
disable_cuda_graph = True
# Largest batch replayed from a CUDA graph (--cuda-graph-max-bs, from 0.5.14
# --cuda-graph-max-bs-decode); null: SGLang sizes it for the GPU. Only with CUDA graphs on.
cuda_graph_max_bs = None
# Tokens in one chunk of a chunked prefill (--chunked-prefill-size); -1 turns chunking off;
# null: SGLang's size for the GPU.
chunked_prefill_size = None
# Order of the waiting requests (--schedule-policy): lpm, random, fcfs, dfs-weight, lof,
# priority, routing-key; from 0.5.22 also hrrn, shortest-prefill-first; null: SGLang's (fcfs).
schedule_policy = None
# FlashInfer allreduce fusion (never on compute capability 12.x):
# --enable-flashinfer-allreduce-fusion, from 0.5.14 --flashinfer-allreduce-fusion-backend auto.
enable_flashinfer_allreduce_fusion = False
# Prometheus metrics at the server's /metrics (--enable-metrics), read during each benchmark
# level; served without the API key: set false to hide them where server_host is reachable.
enable_metrics = True
# More server flags, appended as given, e.g. ["--disable-shared-experts-fusion"].
extra_server_args = []
# Persistent cache of sglang and the FlashInfer autotune (SGLANG_CACHE_DIR).
sglang_cache_dir = "/var/cache/sglang"
# Hugging Face token ("env:NAME" reads it from the environment); only in the 0600 env file.
hf_token = None
# API key the server requires ("env:NAME" reads it from the environment); only in the env file.
api_key = None
# Seconds to wait for /health after a (re)start (1..86400): a 400 GB model loads for many minutes.
health_timeout_s = 3600
# Seconds the server's log may stay silent during its start before the deploy calls it stuck
# (1..86400): long enough for a FlashInfer autotune that prints nothing for many minutes.
startup_stall_s = 900
# Restart a running server when its unit, env file or stack changes; false: write the files and
# warn "restart pending" on every run until the server is restarted by hand.
restart_on_change = True
# A new stack (another lock: sglang_version or any pin) that fails its start (crash, stall,
# crash loop) or answers degenerate text is an upgrade that failed: switch back to the previous
# stack, restart it and wait until it serves, then fail the host naming both releases; false:
# keep the failed release running for debugging (said loudly).
upgrade_rollback = True
# Seconds a new stack stays on trial after its verdict (0..604800; 0: the trial ends at the
# verdict): a crash loop within them makes systemd switch back to the previous stack and start it
# (the unit's OnFailure=), and a run that finds the server restarted on its own since the switch
# rolls it back; both record the set as failed. The previous stack is kept until then.
upgrade_probation_s = 1800
# Try again a set whose upgrade failed and was rolled back here before (recorded in the
# container); false: a run that asks for it stops before any change, saying when and why it failed.
retry_failed_stack = False
# Stacks (venvs, one per lock, built beside the serving one) kept per container, newest first
# (1..100); the serving stack and its rollback target are always kept, older ones removed. The
# host's wheel store keeps every set a container holds and this many newest (the largest of its
# containers'); older sets, their layers and wheels are removed (docs/upgrades.md).
stack_retention = 2
# After the server is ready, check one short chat completion (HTTP 200, not degenerate).
generation_check = True
# Seconds the chat completion of generation_check may take in all (1..3600): the headers and
# every chunk of its stream. A server that answers nothing in that time fails the check (a new
# stack on trial is rolled back).
generation_timeout_s = 60
# Containers serving one model together (inventory names, rank 0 first); [] for one node.
nodes = []
# Rank 0's address for --dist-init-addr; null: rank 0's container hostname.
dist_init_addr = None
# Port for --dist-init-addr, the same on every node.
dist_init_port = 50000

# --- Verify -------------------------------------------------------------------------------
# Run sglang.bench_serving after the server answers (one run per concurrency level).
bench = False
# "full": the levels of bench_concurrencies; "quick": those of bench_quick_concurrencies (a smoke run).
bench_preset = "full"
# Concurrencies of the full preset (--max-concurrency): up to the 1024 where the tuned run peaked.
bench_concurrencies = [1, 64, 256, 1024]
# Concurrencies of the quick preset.
bench_quick_concurrencies = [1, 16]
# Prompts of a run: at least this many, or bench_prompts_per_concurrency x its concurrency if more.
bench_num_prompts = 32
# Prompts per concurrent request in a run (4 at 1024 concurrent: 4096 prompts).
bench_prompts_per_concurrency = 4
# Random input length in tokens.
bench_input_len = 1024
# Output length in tokens.
bench_output_len = 256
# A JSONL file of your own prompts on this machine, one
# {"conversations": [{"content": PROMPT}, {"content": ANSWER}]} a line (SGLang's "custom"
# dataset): the benchmark and make tune send these (bench_output_len tokens asked of each)
# instead of random prompts of bench_input_len tokens; null: random prompts.
bench_prompts_file = None
# Each run's table goes to DIR/<host>/<UTC time>.json on the machine running pyinfra (relative to
# the directory pyinfra runs in), with DIR/<host>/output_tok_s.png plotting the host's runs.
bench_history_dir = "bench-history"
# Warn when a level's output tok/s falls more than this percentage below the previous run's.
bench_regression_pct = 10
# Milliseconds between two nvidia-smi samples of each GPU while a level runs.
bench_gpu_sample_ms = 500
# Milliseconds between two reads of the server's /metrics while a level runs (enable_metrics).
bench_metrics_sample_ms = 1000
# Warn (with tuning hints) when GPUs draw on average under this share of their power limit, in
# percent, at the highest concurrency.
bench_low_power_pct = 60

# --- Tuning (make tune) ---------------------------------------------------------------------
# The search's space: setting -> values to try, e.g. {max_running_requests: [null, 256, 512]};
# null: the default space (the request cap, CUDA graphs and their batch size,
# mem_fraction_static, chunked prefill, the MoE backend where the model is MoE, the schedule
# policy). A setting given in the container's own entry is the user's and never moved.
tune_space = None
# Seconds the search may spend in all (restarts and benchmarks); it stops earlier when no
# candidate could beat the best by more than the measured noise.
tune_budget_s = 28800
# Concurrency whose output tok/s is the objective; null: the highest of bench_concurrencies.
tune_concurrency = None
# A try whose p99 time to first token (ms) at that concurrency is above this fails; null: none.
tune_max_p99_ttft_ms = None
# The best flags go to DIR/<host>-<container>.yml on the machine running pyinfra (relative to
# the directory pyinfra runs in); the deploy reads it under the container's own entry.
tune_dir = "tuned"

# --- gateway: SGLang's model gateway (smg) in a container of its own (a host's `gateways:`) ---
# smg release the gateway runs, installed from its hashed lock (group_data/locks/smg-*.txt).
smg_version = "1.13.0"
# Python of the gateway's container, for its lock: Debian 12's 3.11.
gateway_python = "3.11"
# The gateway's venv in its container.
gateway_venv = "/opt/smg/venv"
# systemd unit name of the gateway (<name>.service); its env file is /etc/smg/<name>.env.
gateway_service_name = "smg"
# IP address the gateway listens on; 127.0.0.1 unless you expose it on purpose (0.0.0.0: every
# interface, then set gateway_api_key).
gateway_host = "127.0.0.1"
# Port of the gateway's OpenAI-compatible and SGLang API.
gateway_port = 30000
# Port of the gateway's own Prometheus metrics (smg_*), on gateway_host.
gateway_prometheus_port = 29000
# Routing policy (smg --policy): cache_aware sends a shared prefix to the worker that has it cached.
gateway_policy = "cache_aware"
# Serving containers the gateway fronts (inventory names, e.g. "@pct/pve1/105"); null: every
# serving container of the inventory, which must then serve one model. A multi-node group is one
# worker: its first node's server.
gateway_workers = None
# Seconds between two health checks of each worker (smg --health-check-interval-secs).
gateway_health_check_interval_s = 10
# Seconds a worker's health check may take (smg --health-check-timeout-secs).
gateway_health_check_timeout_s = 5
# Failed checks in a row before the gateway stops routing to a worker (smg --health-failure-threshold).
gateway_health_failure_threshold = 3
# Remove an unhealthy worker from the gateway's list instead of marking it (the next deploy adds it again).
gateway_remove_unhealthy = False
# API key clients must send to the gateway ("env:NAME" reads it from the environment); only in
# its 0600 env file. smg passes a client's key on to the worker, so it must be the workers'
# api_key; null: no key asked, and the gateway sends each worker its own (keep gateway_host local).
gateway_api_key = None
# Folder in the gateway's container holding the lock's wheels (installed offline); null: the
# host's wheel store where its container mounts one (filled by the host phase), else the index.
gateway_wheelhouse = None
# Package index the gateway's wheels come from; null: pip's default.
gateway_pip_index_url = None
# Seconds the deploy waits for the gateway to answer and take its worker list.
gateway_register_timeout_s = 60
# Seconds the gateway keeps trying a worker registered while its server does not answer yet
# (smg --worker-startup-timeout-secs, 1..86400; checked every gateway_health_check_interval_s):
# as long as a server may take to start (health_timeout_s), so that one still loading after a
# reboot is added once it serves. Meanwhile the deploy reports it "not up (registration pending)".
gateway_worker_startup_timeout_s = 3600
# Replicas behind a gateway restarted at once by a change (a release, a flag, the tuned file): each
# is taken out of the gateway's rotation, drained, restarted, judged and given back before the next
# ones, in the inventory's order (1..1000 at a time, never all of them: a roll never takes the last
# healthy replica out). A first deploy, a lone replica and a container without a gateway restart
# as before (docs/gateway.md).
gateway_roll_batch = 1
# Seconds a replica taken out of the rotation waits for its requests in flight to finish before its
# restart cuts those left (counted in the output); 1..86400.
gateway_drain_timeout_s = 300
# When a replica fails its judgement and the roll stops there: "keep" leaves the replicas changed
# before it on the new (the run names them); "back" sends those that switched to a new release
# back to the one they served, in turn (out, back, judged, in), so that the group serves one
# release. A change of a flag or the tuned file keeps no earlier set to go back to: kept, said so.
gateway_roll_failure = "keep"
# Run the benchmark through the gateway after its phase, from its first worker's container (its
# bench_* settings; saved under bench_history_dir/gateway); needs gateway_host off loopback.
gateway_bench = False

# --- monitoring: Debian's Prometheus in a container of its own (a host's `monitoring:`) ---
# IP address Prometheus listens on in its container (0.0.0.0: every interface; it asks no password).
prometheus_host = "127.0.0.1"
# Port of Prometheus's web UI and HTTP API.
prometheus_port = 9090
# Your existing Prometheus's machine (an address the deploy reaches by SSH), set in a host's
# `monitoring:` entry instead of vmid/name: only the scrape configs, rules and keys are written
# there, for your prometheus.yml to include (docs/monitoring.md); null: a container of its own.
prometheus_address = None
# The user Prometheus runs as (Debian's package: prometheus): the owner of the key files.
prometheus_user = "prometheus"
# Folder in the monitoring container holding the deploy's scrape keys (0600) and rule files.
monitoring_dir = "/etc/prometheus/pve-sglang"
# Seconds between two scrapes of each target (and between two rule evaluations).
monitoring_scrape_interval_s = 15
# Seconds a condition must hold before its alert fires (0: at the first evaluation).
monitoring_alert_for_s = 120
# The throughput alert fires below this share of the last benchmark's output tok/s, with a queue.
monitoring_throughput_share = 0.7
# Token usage (KV cache) at or above this, with requests queued, fires an alert.
monitoring_token_usage = 0.95
# GPUs drawing less than this % of their power limit while requests queue fire an alert.
monitoring_low_power_pct = 60
# A server whose scrape went down and up this many times in 30 minutes is restarting in a loop.
monitoring_restarts = 3
# Port of Debian's prometheus-node-exporter on each GPU host (its GPU figures: textfile collector).
node_exporter_port = 9100
# The node exporter's textfile folder (Debian's default), where the GPU sampler writes.
node_textfile_dir = "/var/lib/prometheus/node-exporter"
