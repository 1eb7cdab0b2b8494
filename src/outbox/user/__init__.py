"""The user domain: accounts whose changes send mail through the outbox."""
