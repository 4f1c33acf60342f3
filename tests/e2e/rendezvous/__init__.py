"""End-to-end tests of hpctrain.rendezvous: ranks meeting on a port that is taken."""
