"""Control plane: kill switch enforcement, retry policies, self-healing, fault injection for tests."""
