"""Where funnels live: ``RedisFunnel`` (Lua scripts) and ``MemoryFunnel`` (Python twins)."""
