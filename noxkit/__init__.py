"""noxfile.py's helpers, one idea a module: paths, the dev env, devices, wheels.

A meta path like noxfile.py itself: no stage's PR may edit it.
"""
