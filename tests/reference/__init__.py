"""Pure numpy/python reference implementations written from the spec (the test oracle)."""
