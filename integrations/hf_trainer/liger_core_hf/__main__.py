"""`python -m liger_core_hf train.py ...`: same as `liger-core-run train.py ...`."""

from .launch import main

main()
