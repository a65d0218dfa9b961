import sys

from agentcache.cli import main

sys.exit(main())
