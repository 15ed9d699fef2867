"""gradvault.client."""
