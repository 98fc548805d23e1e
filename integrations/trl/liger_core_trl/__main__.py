"""`python -m liger_core_trl sft ...`: same as `liger-core-trl sft ...`."""

from .launch import main

main()
