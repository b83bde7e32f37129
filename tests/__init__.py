"""treadle's tests, laid out like the package (tests/engine/ tests treadle/engine/, ...).

A package, so that each test module has a unique dotted name (two folders may
hold a test_distributed.py, and spawned workers find their test function by
that name) and the shared helpers here are imported as ``tests.tiny_models``,
``tests.resume_job``, ... from any folder."""
