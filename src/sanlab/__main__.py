"""``python -m sanlab`` (what ``torchrun -m sanlab train ...`` runs in every process)."""

import sys

from sanlab.cli import main

sys.exit(main())
