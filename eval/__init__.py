"""The crl-bench evaluation harness: ``python -m eval.run``."""
