"""Every default of pve-sglang, in one place.

Host data from the hosts file overrides any of these per Proxmox host or per container
(``pve_sglang.settings`` validates the merged result before anything runs). The README's
settings table is checked against this file by a test.
"""

# --- Proxmox host -------------------------------------------------------------------------
# "pve": a Proxmox VE host driven with pct; "lxc": a plain LXC host driven with lxc-* tools.
platform = "pve"
# Plain LXC hosts: where containers live and the Debian release they are created with.
lxc_path = "/var/lib/lxc"
lxc_release = "bookworm"
# Reload nvidia_uvm to bring uvm_disable_hmm in force (only when no GPU process runs).
reload_modules = False
# Proxmox storage that holds container templates, and the template to create containers from.
template_storage = "local"
# A name prefix takes the newest matching template that `pveam available` lists.
template = "debian-12-standard"
# pve-container releases from this one on take native devN: GPU entries (PVE 8.1+).
pve_container_native_dev_min = "5.0.7"

# --- Container ----------------------------------------------------------------------------
# None: "sglang-<VMID or name>".
hostname = None
rootfs_storage = "local-lvm"
rootfs_size_gib = 200
cores = 32
memory_mib = 262144
swap_mib = 0
net0 = "name=eth0,bridge=vmbr0,ip=dhcp"
unprivileged = True
onboot = True
nesting = True
# "all", or a list of GPU indices to pass through, e.g. [0, 1].
gpus = "all"
# Host directories bind-mounted into the container: [{"host_path": ..., "path": ...}].
mounts = []

# --- Stack in the container ---------------------------------------------------------------
# The sglang release; torch and flashinfer must be the versions that release pins.
sglang_version = "0.5.9"
torch_version = "2.9.1"
flashinfer_version = "0.6.3"
cuda_toolkit_version = "12.8"
uv_version = "0.13.8"
venv_path = "/opt/sglang/venv"
# Extra package index (private mirror) and local wheelhouse for air-gapped sites.
pip_index_url = None
wheelhouse = None
# NVIDIA user-space driver: None derives the runfile URL from the host's version.
nvidia_runfile_url = None
nvidia_runfile_path = None

# --- SGLang server ------------------------------------------------------------------------
service_name = "sglang"
model_path = "/models/model"
served_model_name = None
server_host = "127.0.0.1"
server_port = 30000
# None: one tensor-parallel rank per GPU passed through.
tp_size = None
moe_runner_backend = "flashinfer_cutlass"
attention_backend = "flashinfer"
mem_fraction_static = 0.92
# None: no cap (a cap of 64 throttled the tuned run to a quarter of its throughput).
max_running_requests = None
disable_cuda_graph = True
enable_flashinfer_allreduce_fusion = False
extra_server_args = []
sglang_cache_dir = "/var/cache/sglang"
# Secrets go to an EnvironmentFile with mode 0600, never into the unit.
hf_token = None
api_key = None
# Seconds to wait for /health after a (re)start: a 400 GB model loads for many minutes.
health_timeout_s = 3600
# Several nodes: the inventory names of the containers that serve one model, rank 0 first.
nodes = []
dist_init_port = 50000

# --- Verify -------------------------------------------------------------------------------
bench = False
bench_concurrencies = [1, 16, 64]
bench_num_prompts = 64
bench_input_len = 1024
bench_output_len = 256
