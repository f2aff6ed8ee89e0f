"""WebShop, rebuilt offline: a generated catalog or the official data, BM25 search, the official reward.

Ids: ``crl/WebShop-v0`` (generated catalog) and ``crl/WebShop-Official-v0`` (``$WEBSHOP_DATA``).
Modules: ``vocab``/``catalog`` (grammar, generator, disk cache), ``official`` (real-data loader),
``search`` (BM25), ``reward`` (the official formula), ``shop`` (catalog + index + splits),
``site`` (pages as a state machine), ``env`` (the TextEnv), ``solver`` (the oracle).
"""

from __future__ import annotations
