import sys

from t5nb.cli import main

sys.exit(main())
