from . import program

raise SystemExit(program())
