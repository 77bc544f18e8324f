"""The model agent: a CSI node plugin serving verified Hugging Face snapshots from a node cache.

See docs/models.md for the volume contract, the on-disk layout and the bus reporting.
"""
