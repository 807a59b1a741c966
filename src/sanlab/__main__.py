"""``python -m sanlab`` (what ``torchrun -m sanlab train ...`` runs in every process)."""

import os
import sys
from pathlib import Path

from sanlab.cli import main

if "TORCHELASTIC_ERROR_FILE" in os.environ:
    # a torchrun worker: an unexpected error's message and traceback go into torchrun's failure summary (its
    # "Root Cause"), not only into this rank's stderr; sanlab's own errors are messages, printed by main
    from torch.distributed.elastic.multiprocessing.errors import record

    from sanlab.training.launch import LAUNCH_DIR_ENV, launched
    from sanlab.training.worker_failure import keeping_tracebacks

    if launched():  # `sanlab train --nproc`: its launcher tells a death in a few lines, the tracebacks in launch.log
        main = keeping_tracebacks(main, Path(os.environ[LAUNCH_DIR_ENV]), os.environ.get("RANK", "0"))
    main = record(main)
sys.exit(main())
