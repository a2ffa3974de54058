"""Fixtures of tests/objstore; they live in s3.py so tests/kv can import them too."""

from tests.objstore.s3 import clock, make_objstore, moto_s3, s3_url, store_url  # noqa: F401
