"""miniverl.export"""
