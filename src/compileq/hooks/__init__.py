"""How compileq changes torch: features (one object each, in one ordered list), the ledger of
every attribute they replaced, and import hooks owned by the feature that asked."""
