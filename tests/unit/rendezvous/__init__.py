"""Fast tests of hpctrain.rendezvous."""
