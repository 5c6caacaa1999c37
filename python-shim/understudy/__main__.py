"""python -m understudy {demo,report} ..."""
from understudy.cli import main

raise SystemExit(main())
