"""The broker transport (``celery_funnel.transport``): kombu's Redis transport whose
fetch takes a message and records it as un-acked in one atomic script call, and whose
consumers wake on markers instead of a destructive blocking pop. It writes kombu's own
keys in kombu's own layout: it is the broker's client, beside the funnels, and imports
nothing of them but the script loader."""
