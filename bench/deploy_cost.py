"""What a deploy costs, measured against real LXC containers on this machine (issue 7).

    make bench                       # or: python bench/deploy_cost.py [--reps 5] [--sizes 1,2,4]

The benchmark is the package ``devtools.deploy_cost`` (one module a job: fleet,
driver, runner, counting, report, plot, cli); its method is in bench/README.md, its results
go to bench/results/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: devtools/

from devtools.deploy_cost.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
