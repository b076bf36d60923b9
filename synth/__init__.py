"""Mechanisms that read sensitive data and produce releasable data (they charge the ledger)."""
