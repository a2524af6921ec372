-- One provider charge is booked to one payment at most.
--
-- Every charge carries its payment's downstream key, and a charge is only booked when that key is the
-- payment's own (`oncepay_shared::settlement`), so two payments cannot claim one charge; this index
-- keeps it so even if that check were bypassed. It leads with tenant_id so that it can live on each
-- tenant's shard under a distributed engine (SCALING.md); charge ids are the provider's, and the key
-- check is what keeps them apart across tenants.
CREATE UNIQUE INDEX ledger_entries_charge_booked_once ON ledger_entries (tenant_id, provider_charge_id);
