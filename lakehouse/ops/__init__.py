"""What the operator is told: alerts (`alerts`) and the dashboard's data (`dashboard`)."""
