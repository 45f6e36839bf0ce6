"""`agrpo demo`: the whole system on one machine, learning a small task in minutes."""
