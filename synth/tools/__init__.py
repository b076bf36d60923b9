"""Tools shared by mechanisms and the audit: DP-SGD and secure noise, the random-feature
kernel, the pretrained CNN, face models and recognisers, MRI registration and rendering."""
