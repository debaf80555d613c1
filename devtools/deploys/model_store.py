"""Test and bench deploy: the model step of the deploy alone, on a plain LXC host (``@local``)
and its containers (``@lxc/NAME``).

Host data of the host that fetches (``fetch: True``): ``python`` (with huggingface_hub),
``script`` (``model_store/model_fetch.py`` where it runs), ``repo``, ``revision``, ``root``, ``flat``,
``link``, ``env_file``, ``interval_s``, ``accept_unhashed``. Host data of a container that serves (``serves``: the
model path, where the store's link is mounted read-only): ``repo``.
"""

from pyinfra import host

from pve_sglang.model_store import operations as model

data = host.data

if data.get("fetch"):
    fetch = {"python": data.python, "script": data.script, "repo": data.repo,
             "revision": data.get("revision"), "root": data.root, "flat": bool(data.get("flat")),
             "link": data.get("link"), "env_file": data.get("env_file"),
             "space_of": data.get("space_of") or "the store",
             "accept_unhashed": bool(data.get("accept_unhashed"))}
    # As the deploy does: the preflight before any change, then the fetch.
    planned = model.checked(**fetch)
    model.fetched(name=f"Model {data.repo}", **fetch,
                  interval_s=float(data.get("interval_s") or 10.0), planned=planned)
if data.get("serves"):
    model.served(name=f"Model served from {data.serves}", path=data.serves, repo=data.repo)
