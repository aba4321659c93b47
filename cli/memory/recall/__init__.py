"""Recall: the memories most relevant to a natural-language question, ranked on this
machine after decryption (the query, the scores and the index never leave it).

text (words, stems) and lexical (BM25); dense (embeddings from a packaged model); fusion
(reciprocal rank fusion); index (the in-memory index); cache (the encrypted file between
runs); updater (`Recall`: the index kept current from the relay set); settings.
"""

from cli.memory.recall.index import Hit
from cli.memory.recall.settings import SETTINGS, RecallSettings
from cli.memory.recall.updater import Recall, Recalled

__all__ = ["SETTINGS", "Hit", "Recall", "RecallSettings", "Recalled"]
