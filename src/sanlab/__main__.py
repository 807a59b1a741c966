"""``python -m sanlab`` (what ``torchrun -m sanlab train ...`` runs in every process)."""

import os
import sys

from sanlab.cli import main

if "TORCHELASTIC_ERROR_FILE" in os.environ:
    # a torchrun worker: an unexpected error's message and traceback go into torchrun's failure summary (its
    # "Root Cause"), not only into this rank's stderr; sanlab's own errors are messages, printed by main
    from torch.distributed.elastic.multiprocessing.errors import record

    main = record(main)
sys.exit(main())
