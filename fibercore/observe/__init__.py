"""What a running program shows of itself: ``fiber top`` and the web dashboard read it here.

- :mod:`.registry`: the pools and managers the program made (weakly held).
- :mod:`.snapshot`: one look at the master (jobs, pools, queues, managers, shared objects).
- :mod:`.recorder`: the thread that looks once a second, and samples only while someone
  looks (``fiber top``'s watch file is fresh, or the dashboard is on).
- :mod:`.status`: the per-user directory where a master and ``fiber top`` meet.

Nothing here is imported by the hot paths but :mod:`.registry` (a set insertion when a
Pool or manager is made); see docs/dashboard.md for what is shown and what it costs.
"""
