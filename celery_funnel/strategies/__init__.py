"""The limiting algorithms, one module each: argument building, reply parsing and the
Python twin of the module's Lua script."""
