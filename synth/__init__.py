"""Mechanisms that read sensitive data and produce releasable data. A mechanism never charges the
ledger (it imports no `accounting.ledger`): it plans the events to charge
(`registry.Mechanism.plan`) and runs (`run`), and `release/runner.py` reserves, settles and refunds
those events around the run."""
