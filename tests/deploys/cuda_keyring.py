"""Test deploy: the container phase's CUDA repository keyring step (``tasks.container.cuda_keyring``),
from the host's ``keyring_url`` (a ``file://`` URL in the test container: no internet)."""

import sys
from pathlib import Path

from pyinfra import host

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks.container import CUDA_KEYRING, cuda_keyring  # noqa: E402

cuda_keyring(host.data.get("keyring_url", CUDA_KEYRING.format(repo="debian12")))
