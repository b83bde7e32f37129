"""Research loops as step objects: each file a runnable example, tested against a hand-written loop."""
