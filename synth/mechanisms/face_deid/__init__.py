"""Face de-identification (`mechanism = "face-deid"`): FALCO-style face replacement."""
