"""`python -m mftk`: the one upward import, so the module form behaves like the console script."""
from commands.entry import main

main()
