"""Durable storage for the topic log: frames, the write-ahead log, recovery.

The engine stays pure: it turns each mutation into frame bytes
(:mod:`waymark.log.journal`) and hands them to a journal. Everything here is the
I/O edge behind that seam.
"""
