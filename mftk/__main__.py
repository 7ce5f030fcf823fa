"""`python -m mftk`: the one upward import, so the module form behaves like the console script."""
from commands.app import main

main()
