"""Serving: the exported bundle read back (``load_bundle``: exact or ANN top-k for a user id or a history), its
inputs and query encoder, and the bundle's writing from a finished run (recsys.export)."""

from recsys.serving.bundle import BUNDLE_FORMAT, ServingBundle, load_bundle

__all__ = ["BUNDLE_FORMAT", "ServingBundle", "load_bundle"]
