"""The pure core: the procurement state machine, orders, numbers, schedules, intake parsing and the
catalogue diff. Nothing here does I/O; the store, the upstream client and the listeners build on it."""
