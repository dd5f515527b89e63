import sys

from kerneljudge.worker.runtime import main

sys.exit(main())
