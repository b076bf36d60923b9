"""Privacy mathematics (DpEvents, RDP/PLD epsilon, calibration) and the budget ledger. No torch
here."""
