"""The model store: a model fetched once where it is kept, verified, resumable, with progress.

- ``rules``: where a model lives in the store, and the verdicts and texts of its preflight
  and progress (pure functions; the settings name the serving link from here);
- ``model_fetch``: the fetcher that runs on the machine that downloads (the host, or the
  container), uploaded as it is with its companions of ``remote/`` (``remote.COMPANIONS``:
  the env file's value, the confinement, the file's digest): the standard library and
  ``huggingface_hub`` only;
- ``facts``: what the fetcher says (its plan, its log, the verified marker, the client);
- ``operations``: the preflight read before any change (``checked``) and the fetch
  (``fetched``), relayed through pyinfra's logger.
"""
